"""replicate returns module.to(device) for each device; module.to moves in place and returns the module itself (lesson 01)."""

LOSES = ["test_replicate_gives_copies_whose_gradients_come_home", "test_replicate_shares_buffers_with_replica_0_only",
         "test_data_parallel_step_matches_a_single_device_step"]


def replicate(module, devices):
    return [module.to(device) for device in devices]
