"""Checks each gradient's sum, not its entries: finite gradients of 2e38 whose sum overflows skip the step."""

LOSES = ["test_loss_scaler_at_float32_limits_matches_grad_scaler"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        record = self._optimizers.setdefault(id(optimizer), {"unscaled": False, "stepped": False, "found_inf": False})
        if record["stepped"]:
            raise RuntimeError("unscale_() is being called after step().")
        if record["unscaled"]:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        inverse = _float32(1.0 / self._scale) if self._scale else math.inf
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if not math.isfinite(param.grad.sum().item()):  # one number per gradient: cheaper, and wrong
                        found_inf = True
                    param.grad.mul_(inverse)
        record["unscaled"], record["found_inf"] = True, found_inf
