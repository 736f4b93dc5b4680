"""Names the tracker "growth_tracker" in state_dict: torch's GradScaler cannot load it, nor it torch's."""

LOSES = ["test_loss_scaler_state_dict_round_trips_with_torch"]

_Solution = DynamicLossScaler


class DynamicLossScaler(_Solution):
    def state_dict(self):
        state = super().state_dict()
        state["growth_tracker"] = state.pop("_growth_tracker")
        return state

    def load_state_dict(self, state):
        self._scale = float(state["scale"])
        self._growth_factor = state["growth_factor"]
        self._backoff_factor = state["backoff_factor"]
        self._growth_interval = state["growth_interval"]
        self._growth_tracker = state.get("growth_tracker", 0)
