-- wrk script for bench/topics_http.py: POST a fixed JSON body to the URL's path.
-- The body is read from the file named by $WAYMARK_BODY (built by the Python side).
local f = assert(io.open(os.getenv("WAYMARK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
