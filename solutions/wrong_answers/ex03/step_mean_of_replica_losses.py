"""data_parallel_step takes a loss per replica on its own chunk and averages them (wrong when chunks are uneven)."""

LOSES = ["test_data_parallel_step_matches_a_single_device_step"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = parallel_apply(replicas, chunks)
    losses = [loss_fn(out, part.to(out.device)) for out, part in zip(outputs, scatter(targets, devices))]
    loss = gather(losses, devices[0]).mean()  # what Trainer-style code does with DataParallel's per-replica losses
    loss.backward()
    optimizer.step()
    return loss.item()
