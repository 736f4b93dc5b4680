"""Checks only init_scale > 0: inf, or 1e39 (inf in float32), is taken, and every step is then skipped."""

LOSES = ["test_loss_scaler_rejects_bad_arguments"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        super().__init__(1.0, growth_factor, backoff_factor, growth_interval)
        if isinstance(init_scale, bool) or not init_scale > 0:
            raise ValueError(f"init_scale is {init_scale!r}: pass a number above 0")
        self._scale = _float32(init_scale)
