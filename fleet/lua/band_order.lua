-- Band order (policies/band_order.py): bands are strict, highest first; a lower band runs only when no
-- ticket of a higher band can. Aging is the starvation guard: a ticket that waited a band's aging_ms
-- moves to the band above.

local function bands_in_order() return BANDS end

-- tickets of band i that entered it at or before this time move up one band; nil when none do
local function aging_cutoff(i)
  if i < 2 or BANDS[i].aging_ms <= 0 then return nil end
  return NOW - BANDS[i].aging_ms
end
