"""The model lesson 09 trains with every parallelism composed (notebooks/09_putting_it_together.ipynb).

    llama.py   LlamaConfig (and Llama 3.1's shapes), Llama: a small decoder with torchtitan's module names
               (RMSNorm, rotary embeddings, SwiGLU, causal grouped-query attention), built on `meta` and
               initialised after sharding (its parameters and FLOPs are counted by the planner,
               `course_lib.parallel.planner.ModelShape.of(config)`)
    moe.py     MoEConfig and MoE, the mixture-of-experts MLP in one process: route (top-k, capacity, drops),
               run_experts, load_balancing_loss (Switch Transformer's)

A layer between the toolkit and `course_lib.parallel`: it imports torch only, and `parallel/` may import it.
"""

from course_lib.models.llama import (Attention, CausalAttention, FeedForward, Llama, LlamaConfig, TransformerBlock,
                                     apply_rope, ffn_hidden_dim, init_std, rope_tables)
from course_lib.models.moe import (GroupedExperts, MoE, MoEConfig, Routing, expert_capacity, fill_seeded_,
                                   load_balancing_loss, moe_param_std, route, run_experts)

__all__ = ["LlamaConfig", "Llama", "TransformerBlock", "Attention", "CausalAttention", "FeedForward", "apply_rope",
           "rope_tables", "ffn_hidden_dim", "init_std", "MoEConfig", "MoE",
           "GroupedExperts", "Routing", "route", "run_experts", "expert_capacity", "load_balancing_loss",
           "moe_param_std", "fill_seeded_"]
