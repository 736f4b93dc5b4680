"""data_parallel_step runs the model itself on every chunk, in threads, instead of one replica per device."""

LOSES = ["test_data_parallel_step_matches_a_single_device_step"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    outputs = parallel_apply([model] * len(chunks), chunks)  # "the devices are all the CPU anyway"
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
