"""data_parallel_step returns the loss tensor (detached) instead of a Python float."""

LOSES = ["test_data_parallel_step_computes_the_loss_once_on_the_gathered_output"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = parallel_apply(replicas, chunks)
    loss = loss_fn(gather(outputs, devices[0]), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()  # "float(loss) works on it anyway"
