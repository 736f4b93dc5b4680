"""Returns 1.0 for broadcast and reduce before checking the world size: bus_bandwidth_factor('broadcast', 0) passes."""

LOSES = ["test_bus_bandwidth_factor_rejects_bad_input"]

_factor = bus_bandwidth_factor


def bus_bandwidth_factor(collective, world_size):
    if collective in ("broadcast", "reduce"):
        return 1.0
    return _factor(collective, world_size)
