"""Returns the inner optimizer's state_dict: this rank's shard, numbered by its own parameters, not torch's format."""

LOSES = ["test_sharded_optimizer_state_dict_resumes_like_torchs"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)
