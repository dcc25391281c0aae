"""``WrittenResourcesServer``: a NeMo Gym resources server in front of an environment of any protocol gymhost
speaks (the backend the config's ``source.kind`` names, ``_registry``; the rest does not know which).

A written folder's ``app.py`` subclasses it (to say where the folder is) and Gym's launcher, ``gymhost serve`` or
``create_app`` runs it like any resources server. This module is the Gym-facing glue only: it turns
``/seed_session``, ``POST /<tool>``, ``/verify`` and ``/close_session`` into calls on ``Episodes`` and their
answers into Gym's response models. It serves both session flows: the cookie flow verifiers and Gym's
agents use, and nemo-gym 0.7.0's ``resources_session_id`` flow, where the caller names the session.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from nemo_gym import base_resources_server as gym
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SerializeAsAny, ValidationError, field_validator
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route, request_response

from .._hosting._lifespan import wrap_lifespan
from .._hosting._routes import hot_routes_first
from .._metrics import EpisodeMetrics
from .._sessions._cookie import SEEDED_KEY
from ..middleware.masked_verdicts import VERDICT_FIELDS, MaskedVerdictsMiddleware, launcher_mode
from ._backend import ServerFolder, resolve_in
from ._episodes import Episodes
from ._errors import CatalogError, EpisodeStateError, SessionConflictError, UnknownTaskError
from ._outcomes import Verdict, sendable, sendable_json
from ._pool import Pool
from ._registry import backend_of
from ._settings import DEFAULT_TASKS, EpisodeFields, EpisodeSettings, PoolFields, PoolSettings, SourceConfig
from ._tasks import Task, load_task_folder

__all__ = ["WrittenResourcesServer", "WrittenResourcesServerConfig"]

# nemo-gym 0.5+ has the Environment Server session contract; 0.4.0 knows only the cookie flow.
_RESOURCES_FLOW = hasattr(gym, "ResourcesSeedSessionRequest")

# A session's seed sets ``SEEDED_KEY`` in its signed cookie: it has played an episode. A session plays one, and its
# cookie says so to this server however long ago that was (``Episodes.seed``'s ``again``), and to a request that names
# another session in its body (nemo-gym 0.5+'s resources flow). Gym's agents POST the model's function calls to
# ``/<name>`` with its episode's cookie, and keep the answer's Set-Cookie for the trainer's verify: a seed naming a
# session and task of the model's choice would move that verify there, a close would end another rollout's episode.
# A caller that plays each session with its own cookies (an Environment Server, gymhost's clients) never does either.
_ANOTHER_SESSION = (
    "this request carries the cookie of a session that played an episode; a {call} naming session {key} must come "
    "without it (each session is played with its own cookies)"
)


class WrittenResourcesServerConfig(gym.BaseResourcesServerConfig, PoolFields, EpisodeFields):  # type: ignore[misc]
    """A written server's config block: Gym's fields, the environment and its source, and the limits (declared, with
    their defaults, in ``_settings``)."""

    environment: str = Field(description="The environment card's name; startup refuses any other environment.")
    # as its kind's class (Backend.source_config) when dumped too: the config Gym's global config holds is the whole
    source: SerializeAsAny[SourceConfig]
    tasks: str = Field(
        default=DEFAULT_TASKS, description="Folder of <split>.jsonl task files, relative to the server folder"
    )

    @field_validator("source", mode="before")
    @classmethod
    def _kinds_fields(cls, block: Any) -> SourceConfig:
        """The block read with its kind's class (``Backend.source_config``): each kind has fields of its own. The
        registry is above the settings its backends read, so the kind is looked up here, not there."""
        if isinstance(block, SourceConfig):
            return block
        if not isinstance(block, Mapping) or "kind" not in block:
            raise ValueError("source: expected a mapping with a kind")
        fields = backend_of(str(block["kind"])).source_config
        try:
            return fields.model_validate(dict(block))
        except ValidationError as error:
            where = (f"source.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ValueError(f"source.kind {block['kind']}: {'; '.join(where)}") from None


class SeedRequest(gym.BaseSeedSessionRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")

    task_id: str
    split: str | None = None


class VerifyRequest(gym.BaseVerifyRequest):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")

    task_id: str | None = None


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="allow")


class CriterionScore(BaseModel):
    id: str
    kind: str
    score: float
    detail: str


class VerifyResponse(gym.BaseVerifyResponse):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")

    # Declared here too because nemo-gym 0.4.0's BaseVerifyResponse has only `reward`.
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    criteria: list[CriterionScore] = Field(default_factory=list)


if _RESOURCES_FLOW:
    SeedBody: Any = gym.ResourcesSeedSessionRequest | SeedRequest
    CloseBody: Any = gym.ResourcesCloseSessionRequest | CloseRequest
else:
    SeedBody = SeedRequest
    CloseBody = CloseRequest


class WrittenResourcesServer(gym.SimpleResourcesServer):  # type: ignore[misc]
    """Serves an agentenv environment's tasks as a Gym resources server.

    Subclass it in the folder's ``app.py`` with ``folder = Path(__file__).resolve().parent``; relative paths in
    the config (bundle, tasks) are resolved against it (against the working directory when unset, which is
    where Gym's launcher starts a server).
    """

    config: WrittenResourcesServerConfig
    folder: ClassVar[Path | None] = None
    ray_enabled: ClassVar[bool] = False

    _episodes: Episodes | None = PrivateAttr(default=None)
    _metrics: Any = PrivateAttr(default=None)
    _tasks: dict[str, list[Task]] = PrivateAttr(default_factory=dict)
    _tool_routes: list[BaseRoute] = PrivateAttr(default_factory=list)  # what ``_register_tools`` added last

    def setup_webserver(self) -> FastAPI:
        # Files first, so a folder with a broken task or a missing bundle fails before anything starts.
        tasks = self._path(self.config.tasks, "tasks")
        self._tasks = load_task_folder(tasks)
        backend = backend_of(self.config.source.kind)
        folder = ServerFolder(self._path, self._tasks, self.config.environment, type(self).__name__, tasks)
        launcher = backend.launcher(self.config.source, folder)
        app: FastAPI = super().setup_webserver()
        if launcher_mode() == "refuse":  # under Gym's launcher; gymhost's own hosting places the layer itself
            app.user_middleware.append(Middleware(MaskedVerdictsMiddleware))  # innermost: below the rollout paths
        if not _RESOURCES_FLOW:
            app.post("/close_session")(self.close_resources_session)
        app.get("/agentenv/pool", summary="The environment instances and open episodes")(self.pool_status)
        app.get("/agentenv/pool/{index}", summary="One instance, with its state (data/get)")(self.instance_status)

        @asynccontextmanager
        async def environment(app_: FastAPI) -> AsyncIterator[None]:
            config = self.config
            metrics = self._metrics if self._metrics is not None else EpisodeMetrics()
            episodes = Episodes(
                Pool(launcher, *backend.bounds(config.source), PoolSettings.of(config), metrics),
                self._tasks,
                config.environment,
                EpisodeSettings.of(config),
                backend.check_task,
                metrics,
            )
            await episodes.start()
            self._episodes = episodes
            try:
                self._register_tools(app_, episodes)
                yield
            finally:
                self._episodes = None
                await episodes.stop()

        wrap_lifespan(app, environment)
        return app

    # -- Gym's endpoints ----------------------------------------------------------------------------------------

    async def seed_session(self, request: Request, body: SeedBody) -> Response:
        runtime = self._running()
        seeded = bool(request.session.get(SEEDED_KEY))
        if _RESOURCES_FLOW and isinstance(body, gym.ResourcesSeedSessionRequest):
            # The caller names the session; the cookie carries that name so tool calls and verify find it.
            key = body.resources_session_id
            if seeded and request.session.get(SESSION_ID_KEY) != key:
                return _error(409, _ANOTHER_SESSION.format(call="seed", key=key))
            request.session[SESSION_ID_KEY] = key
            split = body.task_data.get("split")
            task_id = body.task_data.get("task_id") or body.task_id.task_id
            identity: Any = (body.episode_id.model_dump_json(), body.task_id.model_dump_json())
        else:
            key, split, task_id, identity = request.session[SESSION_ID_KEY], body.split, body.task_id, None
        try:
            episode = await runtime.seed(
                key, split if isinstance(split, str) else None, str(task_id), identity, again=seeded
            )
        except UnknownTaskError as error:
            return _error(404, str(error))
        except SessionConflictError as error:
            return _error(409, str(error))
        request.session[SEEDED_KEY] = True  # in the answer's cookie, a failed seed's included
        if episode.failure is not None:
            detail = {"detail": episode.failure.reason, "failure_kind": episode.failure.kind}
            return JSONResponse(detail, status_code=503, headers={"Retry-After": "1"})
        if identity is not None:
            return JSONResponse(gym.ResourcesSeedSessionResponse(resources_session_id=key).model_dump(mode="json"))
        return JSONResponse({"task_id": episode.task.id})

    async def verify(self, request: Request, body: VerifyRequest) -> Response:
        try:
            key = request.session[SESSION_ID_KEY]
            verdict = await self._running().verify(key, _final_text(body.response), body.task_id)
        except EpisodeStateError as error:
            detail: dict[str, Any] = {"detail": str(error)}
            if isinstance(error.verdict, Verdict):
                detail["verdict"] = _verify_response(body, error.verdict).model_dump(
                    mode="json", include=set(VERDICT_FIELDS)
                )
            return JSONResponse(detail, status_code=409)
        # Masked or not, the verdict is answered as a 200 here; middleware.masked_verdicts applies the rule for how a
        # masked one reaches the client. pydantic writes what JSON cannot carry (an infinite float the row brought)
        # as null; json.dumps would raise.
        return Response(_verify_response(body, verdict).model_dump_json(), media_type="application/json")

    async def close_resources_session(self, request: Request, body: CloseBody) -> Response:
        if _RESOURCES_FLOW and isinstance(body, gym.ResourcesCloseSessionRequest):
            key = body.resources_session_id
            runtime = self._running()
            another = request.session.get(SEEDED_KEY) and request.session.get(SESSION_ID_KEY) != key
            if another and runtime.holds(key):  # (a close that ends nothing is harmless: Gym's contract check)
                return _error(409, _ANOTHER_SESSION.format(call="close", key=key))
            await runtime.close(key)
            return JSONResponse(gym.ResourcesCloseSessionResponse(resources_session_id=key).model_dump(mode="json"))
        await self._running().close(request.session[SESSION_ID_KEY])
        return JSONResponse({})

    async def aggregate_metrics(self, body: gym.AggregateMetricsRequest) -> Any:
        """Gym's, with the verify responses it cannot index (no rollout keys, duplicates) answered 422, not 500."""
        try:
            return await super().aggregate_metrics(body)
        except (KeyError, ValueError) as error:
            raise HTTPException(422, f"verify_responses cannot be aggregated: {error!r}") from None

    async def pool_status(self) -> dict[str, Any]:
        return self._running().status()

    async def instance_status(self, index: int) -> Response:
        answer = await self._running().pool.instance_status(index)
        if answer is None:
            raise HTTPException(404, f"no instance {index}")
        try:
            shown = sendable_json(answer)  # its state is hosted code's
        except RecursionError:  # read where the stack was shallower than here
            shown = sendable_json({**answer, "data": None, "error": "its state is nested too deeply to show"})
        return Response(shown, media_type="application/json")

    # -- what gymhost's operating layer asks (``_hosting._operating.EpisodeSource``) -----------------------------------

    def gymhost_bind_metrics(self, metrics: Any) -> None:
        self._metrics = metrics

    def gymhost_open_episodes(self) -> int:
        return self._episodes.open_episodes() if self._episodes is not None else 0

    def gymhost_not_ready(self) -> str | None:
        if self._episodes is None:
            return "starting: the environment pool is not running yet"
        return self._episodes.pool.not_ready()

    def gymhost_gauges(self) -> dict[str, Any]:
        return self._episodes.gauges() if self._episodes is not None else {"open_episodes": 0}

    # -- internals ----------------------------------------------------------------------------------------------

    def _running(self) -> Episodes:
        if self._episodes is None:
            raise HTTPException(
                503,
                "the environment pool is not running: the app's lifespan has not started (mounted in an app of "
                "yours? that app runs its mounts' lifespans with lifespan=gymhost.mounted_lifespan)",
            )
        return self._episodes

    def _register_tools(self, app: FastAPI, episodes: Episodes) -> None:
        """A route for each of the environment's tools, then ``/{name}`` for a tool it does not have. A second
        lifespan cycle of the same app replaces the first cycle's routes: the environment it starts may have other
        tools (its ``env.py`` edited meanwhile), and a tool left from before would answer, or a new one be taken by
        the first cycle's ``/{name}``, which names the old tools. A tool whose path a POST route of the app's own
        already takes is refused: that route would answer its calls."""
        ours = {id(route) for route in self._tool_routes}
        app.router.routes[:] = [route for route in app.router.routes if id(route) not in ours]
        taken = {
            route.path for route in app.router.routes if isinstance(route, Route) and "POST" in (route.methods or ())
        }
        for tool in episodes.tools:
            if f"/{tool['name']}" in taken:
                raise CatalogError(
                    f"tool {tool['name']!r} clashes with the app's own POST /{tool['name']} route "
                    f"({type(self).__name__}); rename the tool or the route"
                )
        kept = {id(route) for route in app.router.routes}
        try:
            for tool in episodes.tools:
                app.router.add_api_route(
                    f"/{tool['name']}",
                    self._tool_endpoint(tool["name"]),
                    route_class_override=_ToolRoute,
                    methods=["POST"],
                    summary=tool["name"],
                    description=tool.get("description") or "",
                    response_class=PlainTextResponse,
                    openapi_extra={
                        "requestBody": {
                            "required": False,
                            "content": {"application/json": {"schema": tool.get("inputSchema") or {}}},
                        }
                    },
                )
            # Last, so it answers only a POST no other route took: a tool this server does not have.
            names = ", ".join(tool["name"] for tool in episodes.tools)

            async def unknown_tool(request: Request) -> Response:
                name = request.path_params["name"]
                return _error(404, f"no tool {name!r} here; the tools are: {names}")

            app.router.add_api_route(
                "/{name}", unknown_tool, route_class_override=_ToolRoute, methods=["POST"], include_in_schema=False
            )
        finally:  # whatever was added, so that the next cycle takes it out
            self._tool_routes = [route for route in app.router.routes if id(route) not in kept]
        hot_routes_first(app.router)
        app.openapi_schema = None  # the document lists this cycle's tools, whatever FastAPI's own cache key

    def _tool_endpoint(self, name: str) -> Callable[[Request], Any]:
        async def call_tool(request: Request) -> Response:
            raw = await request.body()
            try:
                arguments = _read_arguments(raw) if raw.strip() else {}
                # Whatever the body's declared type, what goes to the environment must encode as JSON text again
                # (a lone surrogate parses, and fails only on the way out, where it would cost the episode).
                _CHECK.encode(arguments).encode()  # 1e999 parses as inf
            except ValueError as error:  # not JSON, not UTF-8, NaN/Infinity, or a lone surrogate
                return _error(400, f"the arguments of {name} must be a JSON object: {error}")
            except RecursionError:
                return _error(400, f"the arguments of {name} are nested too deeply")
            if not isinstance(arguments, dict):
                return _error(400, f"the arguments of {name} must be a JSON object, not {type(arguments).__name__}")
            reply = await self._running().call_tool(request.session[SESSION_ID_KEY], name, arguments)
            if reply.refused:
                return _error(reply.status, reply.text)
            return PlainTextResponse(sendable(reply.text), status_code=reply.status)

        call_tool.__name__ = f"tool_{name}"
        return call_tool

    def _path(self, value: str, what: str) -> Path:
        return resolve_in(self.folder if self.folder is not None else Path.cwd(), value, what, type(self).__name__)


class _ToolRoute(APIRoute):
    """A tool's route, whose endpoint reads the request and answers the response itself: FastAPI's handler around
    an endpoint (solving its dependencies, reading and validating a body, validating and serializing a response)
    has nothing to do here but costs every call, so the endpoint is the handler. With no dependencies and no body
    size limit of FastAPI's (the written routes have neither), its request wrapper is Starlette's, which FastAPI's
    is with two exit stacks added for dependencies with ``yield`` (they would stay empty). The exception handling
    and the route's OpenAPI entry are FastAPI's own, as for any route."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.dependant.dependencies and getattr(self, "max_body_size", None) is None:
            self.app = request_response(self.get_route_handler())

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        if self.dependant.dependencies:  # a router's dependencies would need solving: FastAPI's handler, then
            return super().get_route_handler()
        handler: Callable[[Request], Coroutine[Any, Any, Response]] = self.endpoint
        return handler


def _error(status: int, detail: str) -> Response:
    """gymhost's own refusals, shaped like FastAPI's errors, so a client reads every error the same way."""
    return JSONResponse({"detail": sendable(detail)}, status_code=status)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


# Made once: given any option, ``json.loads`` and ``json.dumps`` make a new decoder or encoder on every call (about
# 1 µs each on a tool call's path).
_ARGUMENTS = json.JSONDecoder(parse_constant=_no_constant)
_CHECK = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def _read_arguments(raw: bytes) -> Any:
    """``json.loads(raw, parse_constant=_no_constant)``, answer and errors alike: the bytes decoded as it decodes
    them (the UTF encoding it detects, a UTF-8 BOM dropped), then parsed."""
    return _ARGUMENTS.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def _final_text(response: Any) -> str:
    """The last assistant message's text: what response criteria grade."""
    for item in reversed(list(getattr(response, "output", None) or [])):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            content = getattr(item, "content", None)
            if isinstance(content, str):
                return content
            return "".join(getattr(part, "text", None) or "" for part in content or [])
    return ""


def _verify_response(body: VerifyRequest, verdict: Verdict) -> VerifyResponse:
    fields = {key: value for key, value in body.model_dump().items() if key not in VERDICT_FIELDS}
    fields["task_id"] = verdict.task_id or body.task_id  # the task played, whatever a repeated verify's row says
    return VerifyResponse(
        **fields,
        reward=verdict.reward,
        mask_sample=verdict.failure is not None,
        failure_kind=verdict.failure.kind if verdict.failure else None,
        failure_reason=verdict.failure.reason if verdict.failure else None,
        criteria=[
            CriterionScore(id=c.id, kind=c.kind, score=c.score, detail=sendable(c.detail)) for c in verdict.criteria
        ],
    )
