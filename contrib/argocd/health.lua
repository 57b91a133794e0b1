-- Argo CD health check for zklock.io/LockClaim (Lua 5.1, as Argo CD runs it).
-- Install: resource.customizations.health.zklock.io_LockClaim in argocd-cm
-- (docs/operations.md: GitOps). Checked by tests/repository/argocd.rs.
--
-- Pending and Waiting are Progressing (the claim is in its queue); Held is Healthy; Released
-- ends a claim as its holder meant it to and is Healthy, and so is Superseded (newest wins: a
-- newer claim of its group took its place, as its spec asked); Revoked, Expired, Lost and
-- Invalid end it without the lock its workload asked for, and are Degraded with the reason the
-- claim gives.
local hs = {}

local function condition_message(status, type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type and c.message ~= nil and c.message ~= "" then
      return c.message
    end
  end
  return nil
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "No status yet: the operator has not seen this claim (zklock check says why)"
  return hs
end

local phase = status.phase
if phase == "Pending" then
  hs.status = "Progressing"
  hs.message = "Pending: accepted, not queued yet"
elseif phase == "Waiting" then
  hs.status = "Progressing"
  local message = "Waiting"
  if status.position ~= nil then
    message = message .. ", position " .. tostring(status.position)
  end
  if status.waitingFor ~= nil then
    message = message .. ", behind " .. status.waitingFor
  end
  hs.message = message
elseif phase == "Held" then
  hs.status = "Healthy"
  local message = "Held"
  if status.lock ~= nil then
    message = message .. " " .. status.lock
  end
  if status.fencingToken ~= nil then
    message = message .. ", fencing token " .. status.fencingToken
  end
  hs.message = message
elseif phase == "Released" then
  hs.status = "Healthy"
  hs.message = "Released"
elseif phase == "Superseded" then
  hs.status = "Healthy"
  local why = condition_message(status, "Finished")
  if why ~= nil then
    hs.message = "Superseded: " .. why
  else
    hs.message = "Superseded"
  end
else
  hs.status = "Degraded"
  local why = condition_message(status, "Invalid") or condition_message(status, "Finished")
    or condition_message(status, "Held")
  if why ~= nil then
    hs.message = phase .. ": " .. why
  else
    hs.message = phase
  end
end
return hs
