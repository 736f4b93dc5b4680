"""data_parallel_step runs the replicas one after the other in a loop: right numbers, but nothing runs in parallel."""

LOSES = ["test_data_parallel_step_runs_replicas_in_threads_and_keeps_their_order"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = [replica(*chunk) for replica, chunk in zip(replicas, chunks)]
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
