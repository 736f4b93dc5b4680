"""update() with nothing unscaled or stepped since the last one counts a good step instead of raising as torch does."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def update(self):
        if not self._optimizers:
            self._optimizers = {id(self): {"unscaled": True, "stepped": True, "found_inf": False}}
        super().update()
