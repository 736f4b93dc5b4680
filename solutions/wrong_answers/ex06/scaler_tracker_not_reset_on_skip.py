"""Backs off on a skipped step but keeps the growth tracker: the scale grows again too soon."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def update(self):
        if self._optimizers and any(record["found_inf"] for record in self._optimizers.values()):
            self._scale = _float32(self._scale * self._backoff_factor)
            self._optimizers = {}
            return
        super().update()
