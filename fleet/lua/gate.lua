-- The gate (policies/gate.py): whether a replica may be granted more work now. A replica it closes gets
-- no grant, whatever waits; dispatch stops when it closes every replica. Today: a free sequence slot.

local function gate_open(r) return r.slots_free >= 1 end
