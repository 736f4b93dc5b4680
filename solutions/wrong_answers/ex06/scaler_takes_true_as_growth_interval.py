"""Checks growth_interval with isinstance(..., int) only: True passes as 1 step (bools are ints to isinstance)."""

LOSES = ["test_loss_scaler_rejects_bad_arguments"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        if isinstance(growth_interval, int) and growth_interval >= 1:
            growth_interval = int(growth_interval)
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval)
