"""Backs off once per gradient holding an inf or NaN, not once per update(): two bad gradients quarter the scale."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step",
         "test_loss_scaler_with_adam_and_two_optimizers"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        super().unscale_(optimizer)
        bad = sum(1 for group in optimizer.param_groups for p in group["params"]
                  if p.grad is not None and not bool(torch.isfinite(p.grad).all()))
        self._optimizers[id(optimizer)]["bad"] = bad

    def update(self):
        bad = sum(record.get("bad", 0) for record in self._optimizers.values())
        if bad:
            self._scale = _float32(self._scale * self._backoff_factor ** bad)
            self._growth_tracker = 0
            self._optimizers = {}
            return
        super().update()
