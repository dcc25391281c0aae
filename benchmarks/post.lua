-- wrk script: POST a tool call's JSON body with the session cookie of one seeded episode.
-- wrk -s post.lua URL/get_weather, with COOKIE and BODY in the environment.
wrk.method = "POST"
wrk.body = os.getenv("BODY") or '{"city": "Paris"}'
wrk.headers["Content-Type"] = "application/json"
local cookie = os.getenv("COOKIE")
if cookie and cookie ~= "" then
  wrk.headers["Cookie"] = cookie
end
