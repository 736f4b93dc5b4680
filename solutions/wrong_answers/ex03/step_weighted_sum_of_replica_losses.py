"""data_parallel_step never gathers: it sums the replicas' losses weighted by chunk size (same number, not DataParallel's way)."""

LOSES = ["test_data_parallel_step_computes_the_loss_once_on_the_gathered_output"]


def data_parallel_step(model, optimizer, inputs, targets, loss_fn, devices):
    optimizer.zero_grad()
    chunks = scatter(tuple(inputs), devices)
    replicas = replicate(model, devices[: len(chunks)])
    outputs = parallel_apply(replicas, chunks)
    parts = scatter(targets, devices)
    batch = targets.shape[0]
    loss = sum(loss_fn(out, part.to(out.device)).to(devices[0]) * (part.shape[0] / batch)
               for out, part in zip(outputs, parts))  # the weighted mean of the replicas' means is the batch mean
    loss.backward()
    optimizer.step()
    return loss.item()
