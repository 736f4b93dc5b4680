"""data_parallel_step divides the gradients by the number of replicas ("data parallel averages gradients", as DDP does)."""

LOSES = ["test_data_parallel_step_matches_a_single_device_step",
         "test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = parallel_apply(replicas, chunks)
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    with torch.no_grad():
        for param in model.parameters():
            param.grad /= len(replicas)  # but the loss was already a mean over the whole batch
    optimizer.step()
    return loss.item()
