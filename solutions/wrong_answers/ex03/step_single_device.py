"""data_parallel_step just runs the model on the whole batch: the right numbers, with no data parallelism at all."""

LOSES = ["test_data_parallel_step_matches_a_single_device_step",
         "test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    loss = loss_fn(model(*inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
