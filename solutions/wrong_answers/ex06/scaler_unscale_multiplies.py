"""Multiplies the gradients by the scale in unscale_ instead of dividing: steps S**2 times too big."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step",
         "test_loss_scaler_unscales_in_place_once_per_step"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        scale = self._scale
        self._scale = 1.0 / scale  # the solution multiplies by 1 / self._scale
        try:
            super().unscale_(optimizer)
        finally:
            self._scale = scale
