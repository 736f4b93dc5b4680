"""gather detaches the outputs ("moving results needs no gradient"), so backward never reaches the replicas."""

LOSES = ["test_gather_concatenates_in_order_and_keeps_gradients", "test_data_parallel_step_matches_a_single_device_step",
         "test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]

_reference_gather = gather


def gather(outputs, device, dim=0):
    with torch.no_grad():
        return _reference_gather(outputs, device, dim)
