"""Looks for inf with torch.isinf but not for NaN: a NaN gradient gets stepped on."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step",
         "test_loss_scaler_with_adam_and_two_optimizers"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def unscale_(self, optimizer):
        record = self._optimizers.setdefault(id(optimizer), {"unscaled": False, "stepped": False, "found_inf": False})
        if record["stepped"]:
            raise RuntimeError("unscale_() is being called after step().")
        if record["unscaled"]:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        found_inf = found_inf or bool(torch.isinf(param.grad).any())
                        param.grad.div_(self._scale)
        record["unscaled"], record["found_inf"] = True, found_inf
