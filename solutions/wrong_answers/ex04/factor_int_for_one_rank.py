"""Returns the int 0 for a single rank (nothing crosses a link), where every factor is promised as a float."""

LOSES = ["test_bus_bandwidth_factor_table"]

_factor = bus_bandwidth_factor


def bus_bandwidth_factor(collective, world_size):
    factor = _factor(collective, world_size)
    return 0 if factor == 0 else factor
