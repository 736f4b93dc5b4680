"""Never checks the layout: a TP degree that splits no head evenly gives a number instead of an error."""

LOSES = ["test_plan_memory_rejects_bad_layouts"]


def plan_memory(model, layout, stage):
    vocab, dim, layers, heads, kv_heads, ffn = (int(v) for v in model)
    fsdp, tp, pp = (int(v) for v in layout)
    h = dim // heads

    def held(rows, columns=1, split_rows=False, split_columns=False):
        rows, columns = rows // tp if split_rows else rows, columns // tp if split_columns else columns
        return -(-rows // fsdp) * columns

    layer = (held(heads * h, dim, split_rows=True) + 2 * held(kv_heads * h, dim, split_rows=True)
             + held(dim, heads * h, split_columns=True) + 2 * held(ffn, dim, split_rows=True)
             + held(dim, ffn, split_columns=True) + 2 * held(dim))
    n = layers // pp * layer + (held(vocab, dim, split_rows=True) if stage == 0 else 0)
    n += held(dim) + held(vocab, dim, split_rows=True) if stage == pp - 1 else 0
    return {"params": 2 * n, "grads": 2 * n, "optimizer": 12 * n, "total": 16 * n}
