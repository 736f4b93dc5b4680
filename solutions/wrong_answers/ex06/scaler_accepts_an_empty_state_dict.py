"""load_state_dict({}) keeps the current values for every missing key, where torch refuses an empty state dict."""

LOSES = ["test_loss_scaler_state_dict_round_trips_with_torch"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def load_state_dict(self, state):
        self._scale = _float32(float(state.get("scale", self._scale)))
        self._growth_factor = float(state.get("growth_factor", self._growth_factor))
        self._backoff_factor = float(state.get("backoff_factor", self._backoff_factor))
        self._growth_interval = int(state.get("growth_interval", self._growth_interval))
        self._growth_tracker = int(state.get("_growth_tracker", self._growth_tracker))
