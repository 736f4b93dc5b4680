"""replicate makes plain deep copies: their parameters are new leaves, so no gradient ever reaches the module."""

LOSES = ["test_replicate_gives_copies_whose_gradients_come_home", "test_data_parallel_step_matches_a_single_device_step",
         "test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]


def replicate(module, devices):
    return [copy.deepcopy(module).to(device) for device in devices]
