"""Grows the scale without checking that it stays finite: 2.0**127 times 2 becomes inf, where torch keeps 2.0**127."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def update(self):
        if not self._optimizers:
            raise AssertionError("No inf checks were recorded prior to update.")
        if any(record["found_inf"] for record in self._optimizers.values()):
            self._scale = _float32(self._scale * self._backoff_factor)
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale = _float32(self._scale * self._growth_factor)
                self._growth_tracker = 0
        self._optimizers = {}
