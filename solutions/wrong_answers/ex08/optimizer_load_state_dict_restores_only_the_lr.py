"""load_state_dict() restores the per-parameter state and each group's lr, but not the other hyperparameters."""

LOSES = ["test_sharded_optimizer_state_dict_resumes_like_torchs"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def load_state_dict(self, state_dict):
        saved_groups = state_dict["param_groups"]
        param_of = {}
        for saved, group in zip(saved_groups, self.param_groups):
            param_of.update(zip(saved["params"], group["params"]))
            group["lr"] = saved["lr"]
        inner_index, inner_groups, start = {}, [], 0
        for saved, inner in zip(saved_groups, self.optimizer.param_groups):
            for i, param in enumerate(inner["params"], start):
                inner_index.setdefault(id(param), i)
            start += len(inner["params"])
            hyper = {key: value for key, value in inner.items() if key != "params"}
            inner_groups.append({**hyper, "lr": saved["lr"], "params": [inner_index[id(p)] for p in inner["params"]]})
        inner_state = {inner_index[id(param_of[i])]: value for i, value in state_dict["state"].items()
                       if id(param_of[i]) in inner_index}
        self.optimizer.load_state_dict({"state": inner_state, "param_groups": inner_groups})
