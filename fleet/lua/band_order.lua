-- Band order (policies/band_order.py): bands are strict, highest first; a lower band runs only when no
-- ticket of a higher band can. Aging is the starvation guard: a ticket that waited a band's aging_ms
-- moves to the band above.

local function bands_in_order() return BANDS end

-- a ticket may be lifted into band i unless its ceiling (its tenant's allowance; "" none) is below it
local function may_age_into(i, ceiling)
  return ceiling == "" or BAND_INDEX[ceiling] == nil or i >= BAND_INDEX[ceiling]
end

-- tickets of band i that entered it at or before this time move up one band; nil when none do
local function aging_cutoff(i)
  if i < 2 or BANDS[i].aging_ms <= 0 then return nil end
  return NOW - BANDS[i].aging_ms
end
