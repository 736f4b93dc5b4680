"""Counts every step toward growth, skipped ones included, and never resets the tracker on a backoff."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def update(self):
        if not self._optimizers:
            raise AssertionError("No inf checks were recorded prior to update.")
        if any(record["found_inf"] for record in self._optimizers.values()):
            self._scale = _float32(self._scale * self._backoff_factor)
        self._growth_tracker += 1
        if self._growth_tracker == self._growth_interval:
            self._scale = _float32(self._scale * self._growth_factor)
            self._growth_tracker = 0
        self._optimizers = {}
