-- wrk script for bench/change_tracking.py: POST appends of $WAYMARK_BATCH tagged records,
-- the tags cycling over 10 000 keys, so every append changes keys a checkpoint must name.
local batch = tonumber(os.getenv("WAYMARK_BATCH"))
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

request = function()
  local parts = {}
  for i = 1, batch do
    n = n + 1
    local k = n % 10000
    parts[i] = '{"tag":"o' .. k .. '","data":{"order":' .. k .. ',"total":12.5}}'
  end
  return wrk.format(nil, nil, nil, '{"records":[' .. table.concat(parts, ",") .. ']}')
end
