"""Leaves state_dict() to torch.optim.Optimizer: the outer optimizer holds no state, so a checkpoint loses it all."""

LOSES = ["test_sharded_optimizer_state_dict_resumes_like_torchs"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    state_dict = torch.optim.Optimizer.state_dict
    load_state_dict = torch.optim.Optimizer.load_state_dict
