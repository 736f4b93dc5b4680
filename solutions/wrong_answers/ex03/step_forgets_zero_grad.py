"""data_parallel_step never zeroes the old gradients: the second step adds the first step's gradient again."""

LOSES = ["test_data_parallel_step_matches_a_single_device_step"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = parallel_apply(replicas, chunks)
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
