"""The nomenclature: every symbol snlab uses, declared once.

Each entry has a long Python name (used in the API and as the sympy symbol's name),
a short LaTeX name (used when a formula shows itself), a unit (SI base units: bytes,
s, FLOP, bytes/s, FLOP/s; ``1`` for dimensionless numbers and counts) and a meaning.
``table_markdown()`` renders the table that the README links to.

Symbols follow Narayanan et al. 2021 (arXiv 2104.04473) and Korthikanti et al. 2022
(arXiv 2205.05198) where those papers name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from . import kernel as _kernel

_kernel.loaded(__name__)


@dataclass(frozen=True)
class Entry:
    """One symbol: its long name, LaTeX, unit, meaning and sympy assumptions (one of
    :data:`_ASSUME`'s keys). The sympy symbol is made when first asked for, so that the
    nomenclature (and the numbers computed from cached formulas) need no sympy."""

    name: str
    latex: str
    unit: str
    meaning: str
    group: str
    assumption: str

    @cached_property
    def symbol(self):
        """The sympy symbol, named ``name``, with the entry's assumptions."""
        import sympy as sp
        return sp.Symbol(self.name, **_ASSUME[self.assumption])


# (name, latex, unit, meaning, assumption) grouped by topic. Assumptions: "int" =
# positive integer, "nonneg_int" = integer >= 0, "pos" = positive real, "nonneg" = real >= 0,
# "real" = any real.
_TABLE: dict[str, list[tuple[str, str, str, str, str]]] = {
    "model shape": [
        ("layers", "L", "1", "transformer layers", "int"),
        ("hidden_size", "h", "1", "hidden (model) dimension", "int"),
        ("heads", "a", "1", "attention (query) heads", "int"),
        ("kv_heads", r"a_{kv}", "1", "key/value heads (GQA; equal to a for MHA)", "int"),
        ("head_dim", r"d_{h}", "1", "dimension of one attention head", "int"),
        ("ffn_hidden_size", "f", "1", "hidden dimension of the dense MLP", "int"),
        ("vocab_size", "V", "1", "vocabulary size", "int"),
        ("seq_len", "s", "1", "sequence length (tokens per sequence)", "int"),
        ("mlp_matrices", r"n_{mlp}", "1", "weight matrices per MLP: 2 plain, 3 gated (SwiGLU)", "int"),
        ("bias", r"\beta_{b}", "1", "1 if linear layers have biases, else 0", "nonneg_int"),
        ("norm_params", r"n_{norm}", "1", "parameters per hidden element of one norm: 2 LayerNorm, 1 RMSNorm, 0 to exclude", "nonneg_int"),
        ("embedding_copies", r"n_{emb}", "1", "embedding matrices: 1 tied, 2 untied", "int"),
        ("learned_positions", r"\lambda_{pos}", "1", "1 if absolute positions are learned (s x h parameters), else 0", "nonneg_int"),
        ("dropout", r"\delta", "1", "1 if the model trains with dropout (its masks are kept for the backward pass), else 0", "nonneg_int"),
    ],
    "mixture of experts": [
        ("dense_layers", r"L_{d}", "1", "layers with a dense MLP (all layers for a dense model)", "nonneg_int"),
        ("experts", "E", "1", "routed experts per MoE layer", "nonneg_int"),
        ("experts_per_token", "k", "1", "routed experts each token is sent to (top-k)", "nonneg_int"),
        ("shared_experts", r"E_{s}", "1", "shared experts every token uses", "nonneg_int"),
        ("expert_ffn_hidden_size", r"f_{e}", "1", "hidden dimension of one expert's MLP", "nonneg_int"),
    ],
    "latent attention (MLA)": [
        ("q_lora_rank", r"r_{q}", "1", "rank of the compressed query (0: queries not compressed)", "nonneg_int"),
        ("kv_lora_rank", r"r_{kv}", "1", "rank of the compressed key/value latent d_c", "int"),
        ("qk_nope_head_dim", r"d_{nope}", "1", "per-head query/key dimension without rotary part", "int"),
        ("qk_rope_head_dim", r"d_{rope}", "1", "per-head rotary query/key dimension (key part shared by heads)", "int"),
        ("v_head_dim", r"d_{v}", "1", "per-head value dimension", "int"),
    ],
    "parameters": [
        ("params", "N", "1", "parameters of the whole model", "pos"),
        ("active_params", r"N_{act}", "1", "parameters used per token (MoE: routed top-k plus shared)", "pos"),
        ("attention_params", r"P_{att}", "1", "parameters of one attention block", "pos"),
        ("mlp_params", r"P_{mlp}", "1", "parameters of one dense MLP block", "pos"),
        ("moe_params", r"P_{moe}", "1", "parameters of one MoE block (all experts and router)", "pos"),
        ("moe_active_params", r"P_{moe,act}", "1", "parameters of one MoE block used per token", "pos"),
        ("matmul_params", r"N_{mm}", "1", "parameters of the transformer layers' weight matrices used per token", "pos"),
        ("params_per_device", r"P_{dev}", "1", "parameters one device holds before ZeRO sharding", "pos"),
    ],
    "batch and parallelism": [
        ("micro_batch", "b", "1", "micro-batch size (sequences)", "int"),
        ("global_batch", "B", "1", "global batch size (sequences per step)", "int"),
        ("tp", "t", "1", "tensor-parallel degree", "int"),
        ("pp", "p", "1", "pipeline-parallel degree (stages)", "int"),
        ("dp", "d", "1", "data-parallel degree", "int"),
        ("ep", "e", "1", "expert-parallel degree", "int"),
        ("cp", "c", "1", "context-parallel degree", "int"),
        ("interleave", "v", "1", "model chunks (virtual stages) per pipeline stage", "int"),
        ("chunk_overhead", r"\tau_{v}", "s", "time each extra pass through a model chunk costs beyond its compute and sends (interleaved schedule)", "nonneg"),
        ("micro_batches", "m", "1", "micro-batches per pipeline per step, B / (b d)", "int"),
        ("tokens", "T", "1", "tokens processed", "pos"),
        ("context_len", r"n_{ctx}", "1", "tokens each query attends to (s for training without causal skipping; current context in decode)", "nonneg"),
        ("causal_fraction", r"\gamma_{c}", "1", "fraction of the s x s attention scores computed: 1 full, 1/2 for causal kernels that skip masked blocks", "pos"),
    ],
    "precision and memory": [
        ("weight_bytes", r"q_{w}", "bytes", "bytes per weight (2 for bf16)", "pos"),
        ("grad_bytes", r"q_{g}", "bytes", "bytes per gradient (2 bf16, 4 fp32)", "pos"),
        ("optimizer_bytes", r"q_{o}", "bytes", "optimizer bytes per parameter (12 for mixed-precision Adam: fp32 master, momentum, variance)", "nonneg"),
        ("kv_bytes", r"q_{kv}", "bytes", "bytes per KV-cache element", "pos"),
        ("activation_bytes", r"q_{a}", "bytes", "bytes per stored activation element (2 for 16-bit; dropout masks take half)", "pos"),
        ("logit_bytes", r"q_{l}", "bytes", "bytes per output logit kept for the loss (4: fp32)", "pos"),
        ("zero_stage", "z", "1", "ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +weights", "nonneg_int"),
        ("zero_shards", r"d_{z}", "1", "devices the ZeRO state is sharded over (the data-parallel group)", "int"),
        ("recompute", "r", "1", "activation recomputation: 0 none, 1 selective, 2 full", "nonneg_int"),
        ("sequence_parallel", r"\sigma", "1", "1 with sequence parallelism, else 0", "nonneg_int"),
        ("in_flight", r"n_{f}", "1", "micro-batches whose activations a stage holds at once", "pos"),
        ("stage_rank", r"r_{p}", "1", "position of a pipeline stage, 0 for the first", "nonneg_int"),
        ("stage_layers", r"L_{s}", "1", "transformer layers of one pipeline stage", "nonneg"),
        ("ffn_activation_width", r"f_{act}", "1", "MLP hidden width a token's activations span (f dense; (k + E_s) f_e MoE)", "pos"),
        ("query_width", r"w_{q}", "1", "width of a token's queries, a d_qk (h for most dense models)", "pos"),
        ("attention_output_width", r"w_{o}", "1", "width of a token's attention output, the output projection's input, a d_v", "pos"),
        ("latent_width", r"w_{c}", "1", "latent-attention tensors a token keeps: compressed query and key/value and their normalised copies", "nonneg"),
        ("routed_copies", r"k_{r}", "1", "token copies an average layer dispatches to routed experts (k on MoE layers, 0 on dense)", "nonneg"),
        ("router_width", r"E_{r}", "1", "router logits an average layer keeps per token (E on MoE layers)", "nonneg"),
        ("recomputed_replicated_width", r"w_{r}", "1", "elements per token a layer's recomputed modules drop from what tensor parallelism replicates (norm outputs)", "nonneg"),
        ("recomputed_split_width", r"w_{r}'", "1", "elements per token a layer's recomputed modules drop from what tensor parallelism splits", "nonneg"),
        ("fp8_replicated_width", r"w_{8}", "1", "elements per token a layer keeps in FP8 among those tensor parallelism replicates (the linear layers' inputs)", "nonneg"),
        ("fp8_split_width", r"w_{8}'", "1", "elements per token a layer keeps in FP8 among those tensor parallelism splits, less the FP8 copy of the output projection's input", "real"),
        ("weight_memory", r"M_{w}", "bytes", "weight bytes per device", "nonneg"),
        ("grad_memory", r"M_{g}", "bytes", "gradient bytes per device", "nonneg"),
        ("optimizer_memory", r"M_{o}", "bytes", "optimizer-state bytes per device", "nonneg"),
        ("model_state_memory", r"M_{state}", "bytes", "weights + gradients + optimizer state per device", "nonneg"),
        ("activation_memory", r"M_{act}", "bytes", "activation bytes", "nonneg"),
        ("kv_cache_memory", r"M_{kv}", "bytes", "KV-cache bytes", "nonneg"),
        ("capacity", "C", "bytes", "memory capacity", "pos"),
        ("memory_reserve", r"R_{mem}", "bytes", "device memory held before the job allocates (runtime context, communication buffers, driver carve-out)", "nonneg"),
        ("allocator_efficiency", r"\eta_{a}", "1", "fraction of the remaining memory the caching allocator can hand out (the rest is fragmentation)", "pos"),
        ("used_memory", "U", "bytes", "memory needed", "nonneg"),
    ],
    "compute": [
        ("flops", "W", "FLOP", "floating-point operations of a kernel or step (Williams et al. 2009: work)", "nonneg"),
        ("bytes_moved", "Q", "bytes", "bytes a kernel moves to and from memory (Williams et al. 2009: traffic)", "nonneg"),
        ("peak_flops", r"F_{peak}", "FLOP/s", "dense peak compute of one device", "pos"),
        ("gemm_efficiency", r"\eta_{c}", "1", "achievable fraction of peak for large matrix multiplies", "pos"),
        ("memory_bandwidth", r"B_{mem}", "bytes/s", "memory bandwidth of one device", "pos"),
        ("memory_efficiency", r"\eta_{m}", "1", "achievable fraction of memory bandwidth", "pos"),
        ("sustained_clock", r"\kappa", "1", "sustained / boost clock ratio (thermal or power throttling derating)", "pos"),
        ("gemm_m", "M", "1", "rows of the left GEMM operand (tokens)", "int"),
        ("gemm_k", "K", "1", "inner dimension of a GEMM", "int"),
        ("gemm_n", r"N_{g}", "1", "columns of the right GEMM operand", "int"),
        ("gemm_half_elements", r"c_{g}", "1", "output elements (M x N) at which a GEMM runs at half its large-GEMM rate: too few tiles to fill the device", "nonneg"),
        ("gemm_occupancy", r"\omega_{g}", "1", "fraction of its large-GEMM rate a GEMM of M tokens reaches", "nonneg"),
        ("element_bytes", r"q", "bytes", "bytes per matrix element", "pos"),
        ("forward_flops_per_token", r"F_{fwd}", "FLOP", "forward FLOPs per token", "nonneg"),
        ("step_flops", r"W_{step}", "FLOP", "FLOPs of one training step", "nonneg"),
        ("time", r"\tau", "s", "time", "nonneg"),
        ("bubble_fraction", r"\phi_{bubble}", "1", "idle pipeline time as a fraction of the ideal (bubble-free) step", "nonneg"),
        ("utilisation", r"U_{F}", "1", "fraction of the devices' peak FLOP/s spent on counted FLOPs (MFU or HFU)", "nonneg"),
    ],
    "communication": [
        ("message_bytes", "S", "bytes", "bytes in the collective's buffer (per device)", "nonneg"),
        ("group_size", "n", "1", "devices taking part in a collective", "int"),
        ("latency", r"\alpha", "s", "per-message (per-step) latency, software included", "nonneg"),
        ("call_latency", r"\alpha_{0}", "s", "fixed cost of one collective call (launch and synchronisation)", "nonneg"),
        ("link_bandwidth", r"\beta", "bytes/s", "link bandwidth per device, per direction", "pos"),
        ("link_efficiency", r"\eta", "1", "achievable fraction of link bandwidth for collectives", "pos"),
        ("inner_size", r"n_{1}", "1", "devices of the group inside one scale-up domain", "int"),
        ("outer_size", r"n_{2}", "1", "scale-up domains the group spans", "int"),
        ("inner_latency", r"\alpha_{1}", "s", "latency inside the scale-up domain", "nonneg"),
        ("inner_bandwidth", r"\beta_{1}", "bytes/s", "scale-up bandwidth per device, per direction", "pos"),
        ("inner_efficiency", r"\eta_{1}", "1", "achievable fraction of scale-up bandwidth", "pos"),
        ("outer_latency", r"\alpha_{2}", "s", "latency across scale-up domains (scale-out)", "nonneg"),
        ("outer_bandwidth", r"\beta_{2}", "bytes/s", "scale-out bandwidth per device, per direction", "pos"),
        ("outer_efficiency", r"\eta_{2}", "1", "achievable fraction of scale-out bandwidth", "pos"),
        ("axis_size_x", r"k_{x}", "1", "members of the group along axis x of a torus or full mesh (1: the axis is not used)", "int"),
        ("axis_size_y", r"k_{y}", "1", "members of the group along axis y of a torus or full mesh (1: the axis is not used)", "int"),
        ("axis_size_z", r"k_{z}", "1", "members of the group along axis z of a torus or full mesh (1: the axis is not used)", "int"),
        ("axis_paths_x", r"w_{x}", "1", "disjoint paths a collective's data takes per direction along axis x: 2 on a ring with wrap-around, 1 on a line, (k - 1) l on a full-mesh axis of l links per peer", "pos"),
        ("axis_paths_y", r"w_{y}", "1", "disjoint paths a collective's data takes per direction along axis y: 2 on a ring with wrap-around, 1 on a line, (k - 1) l on a full-mesh axis of l links per peer", "pos"),
        ("axis_paths_z", r"w_{z}", "1", "disjoint paths a collective's data takes per direction along axis z: 2 on a ring with wrap-around, 1 on a line, (k - 1) l on a full-mesh axis of l links per peer", "pos"),
        ("axis_steps_x", r"\sigma_{x}", "1", "steps of the collective along axis x: k - 1 on a ring or line, 1 for a direct exchange over a full mesh", "nonneg"),
        ("axis_steps_y", r"\sigma_{y}", "1", "steps of the collective along axis y: k - 1 on a ring or line, 1 for a direct exchange over a full mesh", "nonneg"),
        ("axis_steps_z", r"\sigma_{z}", "1", "steps of the collective along axis z: k - 1 on a ring or line, 1 for a direct exchange over a full mesh", "nonneg"),
        ("axis_cut_x", r"c_{x}", "1", "links per direction crossing a cut that halves the group along axis x (its bisection)", "pos"),
        ("axis_cut_y", r"c_{y}", "1", "links per direction crossing a cut that halves the group along axis y (its bisection)", "pos"),
        ("axis_cut_z", r"c_{z}", "1", "links per direction crossing a cut that halves the group along axis z (its bisection)", "pos"),
        ("axis_bandwidth_x", r"\beta_{x}", "bytes/s", "bandwidth of one link along axis x per direction, as the group's share of it", "pos"),
        ("axis_bandwidth_y", r"\beta_{y}", "bytes/s", "bandwidth of one link along axis y per direction, as the group's share of it", "pos"),
        ("axis_bandwidth_z", r"\beta_{z}", "bytes/s", "bandwidth of one link along axis z per direction, as the group's share of it", "pos"),
        ("axis_latency_x", r"\alpha_{x}", "s", "latency of one step along axis x", "nonneg"),
        ("axis_latency_y", r"\alpha_{y}", "s", "latency of one step along axis y", "nonneg"),
        ("axis_latency_z", r"\alpha_{z}", "s", "latency of one step along axis z", "nonneg"),
        ("overlap", r"\epsilon", "1", "fraction of the overlappable time hidden behind compute, in [0, 1]", "nonneg"),
        ("overlap_contention", r"\kappa_{o}", "1", "compute time lost per second of communication hidden behind it (shared SMs and HBM)", "nonneg"),
        ("compute_time", r"\tau_{c}", "s", "compute time", "nonneg"),
        ("comm_time", r"\tau_{m}", "s", "communication time", "nonneg"),
    ],
    "serving": [
        ("draft_tokens", r"k_{d}", "1", "draft tokens proposed per sequence per decode step (speculative decoding, MTP)", "nonneg_int"),
        ("acceptance_rate", r"\alpha_{a}", "1", "probability that a draft token is accepted, each independently", "nonneg"),
        ("tokens_per_step", r"\tau_{s}", "1", "expected tokens one sequence emits per decode step", "pos"),
        ("step_time", r"\tau_{step}", "s", "time of one decode step (every sequence in flight advances once)", "pos"),
        ("batch_sequences", r"n_{b}", "1", "sequences decoded together by one model replica", "int"),
        ("mean_output_len", r"\mu_{o}", "1", "mean output length of a request (tokens)", "pos"),
        ("decode_steps", r"n_{steps}", "1", "output tokens' worth of decode steps a batch runs", "pos"),
        ("prefill_time", r"\tau_{pf}", "s", "prefill time of one request on its replica", "nonneg"),
        ("throughput", "X", "tokens/s", "output tokens per second", "nonneg"),
        ("local_bytes", r"Q_{loc}", "bytes", "bytes a step's kernels read from the device's own HBM (far bytes staged in included)", "nonneg"),
        ("far_bytes", r"Q_{far}", "bytes", "bytes a step reads from a far memory tier (pool, host, SSD)", "nonneg"),
        ("far_bandwidth", r"B_{far}", "bytes/s", "bandwidth from a far memory tier to one device", "pos"),
        ("far_latency", r"\alpha_{far}", "s", "latency of one read from a far memory tier", "nonneg"),
        ("far_reads", r"n_{r}", "1", "separate reads from a far tier per step (one per layer)", "nonneg"),
        ("far_time", r"\tau_{far}", "s", "time a step spends reading far memory tiers", "nonneg"),
        ("inner_bytes", r"S_{1}", "bytes", "bytes a device sends to peers inside its scale-up domain", "nonneg"),
        ("outer_bytes", r"S_{2}", "bytes", "bytes a device sends to other scale-up domains", "nonneg"),
        ("expert_activation", r"\rho_{e}", "1", "expected fraction of a device's experts that receive at least one token", "nonneg"),
        ("domains_per_token", r"n_{dom}", "1", "expected scale-up domains holding at least one of a token's experts", "nonneg"),
        ("max_sequences", r"n_{max}", "1", "sequences whose KV cache fits in a capacity", "nonneg"),
        ("requests", r"N_{req}", "1", "requests an offline benchmark queues at once (of one replica, in the per-replica formulas)", "int"),
        ("waves", "W", "1", "waves of requests an offline benchmark runs through a replica", "int"),
        ("last_wave_sequences", r"n_{b}'", "1", "sequences of the last wave (the requests left over)", "int"),
        ("prefill_chunks", r"s_{pf}", "1", "steps a wave's prompts are prefilled in (chunked prefill)", "int"),
        ("chunk_time", r"\tau_{ch}", "s", "time of one chunked-prefill step", "nonneg"),
        ("wave_time", r"\tau_{w}", "s", "time of one wave: its chunked prefill, then its decode steps", "nonneg"),
        ("last_wave_time", r"\tau_{w}'", "s", "time of the last wave", "nonneg"),
        ("first_token_chunks", r"s_{f}", "1", "chunked-prefill steps from a wave's start to one of its prompts' "
                                                 "first token, on average", "nonneg"),
        ("first_token_time", r"\tau_{f}", "s", "mean time from a wave's start to one of its requests' first token", "nonneg"),
        ("last_first_token_time", r"\tau_{f}'", "s", "the same for the last wave", "nonneg"),
    ],
    "power and cost": [
        ("idle_power", r"P_{idle}", "W", "device power with a model resident and no kernel running", "pos"),
        ("tdp", r"P_{TDP}", "W", "device power limit (board or package TDP)", "pos"),
        ("compute_activity", r"u_{c}", "1", "fraction of the time the compute units work at their achievable rate", "nonneg"),
        ("memory_activity", r"u_{m}", "1", "fraction of the time HBM streams at its achievable bandwidth", "nonneg"),
        ("link_activity", r"u_{l}", "1", "fraction of the time the scale-up links carry traffic", "nonneg"),
        ("hbm_energy", r"e_{B}", "J/byte", "energy per byte streamed from or to HBM, on-chip movement included, above idle", "nonneg"),
        ("link_energy", r"e_{L}", "J/byte", "energy per byte a device sends over its scale-up links, above idle", "nonneg"),
        ("device_power", r"P_{dev}", "W", "power of one device", "nonneg"),
        ("host_power", r"P_{host}", "W", "power of one node beyond its devices: CPUs, memory, NICs, fans, power conversion", "nonneg"),
        ("switch_power", r"P_{sw}", "W", "power of one scale-up domain's switches and optics", "nonneg"),
        ("network_power", r"P_{net}", "W", "scale-out network power per device: NIC ports, optics, its share of the switches", "nonneg"),
        ("devices", r"N_{dev}", "1", "devices of a job", "pos"),
        ("node_devices", r"n_{node}", "1", "devices in one node (server or compute tray)", "pos"),
        ("domain_devices", r"n_{dom}", "1", "devices in one scale-up domain", "pos"),
        ("it_power", r"P_{IT}", "W", "power of a job's IT equipment: devices, hosts, switches, network", "nonneg"),
        ("pue", r"\mathrm{PUE}", "1", "power usage effectiveness: facility power over IT power (>= 1)", "pos"),
        ("facility_power", r"P_{fac}", "W", "power a job draws from the grid, cooling and conversion included", "nonneg"),
        ("power", "P", "W", "a power", "nonneg"),
        ("energy_per_token", r"E_{tok}", "J", "energy per token", "nonneg"),
        ("device_price", r"c_{h}", "$/s", "price of one device per second of rent (the hourly price / 3600)", "nonneg"),
        ("capex", r"C_{cap}", "$", "purchase price per device, its share of the system included", "nonneg"),
        ("lifetime", r"T_{life}", "s", "years of use the purchase is written off over, in seconds", "pos"),
        ("fleet_utilisation", r"\rho_{f}", "1", "fraction of the paid hours the devices do this work", "pos"),
        ("energy_price", r"c_{E}", "$/J", "price of electricity (the kWh price / 3.6e6)", "nonneg"),
        ("cost_rate", r"\dot{C}", "$/s", "what a job costs per second of its work", "nonneg"),
        ("cost_per_token", r"C_{tok}", "$", "cost per token", "nonneg"),
        ("rack_power_limit", r"P_{rack}", "W", "power a rack may draw (the heat its cooling removes)", "pos"),
        ("rack_devices", r"n_{rack}", "1", "devices in one rack", "pos"),
        ("overhead_power", r"P_{o}", "W", "power per device beyond the device itself: its share of host, switches and network", "nonneg"),
    ],
    "request queues": [
        ("arrival_rate", r"\lambda", "1/s", "requests arriving per second (at one server, in the one-server formulas)", "nonneg"),
        ("service_time", r"\bar{S}", "s", "mean time a server spends on one request", "pos"),
        ("service_scv", r"c_{s}^{2}", "1", "squared coefficient of variation of the service time (0 deterministic, 1 exponential)", "nonneg"),
        ("arrival_scv", r"c_{a}^{2}", "1", "squared coefficient of variation of the time between arrivals (1 for Poisson arrivals)", "nonneg"),
        ("utilization", r"\rho", "1", "fraction of time a server is busy", "nonneg"),
        ("queue_wait", r"W_{q}", "s", "mean time a request waits before its service starts", "nonneg"),
        ("quantile_level", r"q", "1", "probability of a quantile (0.9 for p90)", "pos"),
        ("residence_time", r"W", "s", "mean time a request spends in a part of the system", "nonneg"),
        ("requests_in_flight", r"N_{fl}", "1", "mean number of requests in a part of the system", "nonneg"),
        ("time_per_token", r"\tau_{tok}", "s", "time between two output tokens of one request", "nonneg"),
        ("one_token_pass_time", r"\tau_{1}", "s", "time of a prefill pass over one token (the pass's fixed part)", "nonneg"),
        ("mean_prompt_len", r"\mu_{p}", "1", "mean prompt length of a request (tokens)", "pos"),
        ("step_tokens", r"b_{tok}", "1", "tokens one engine step may process (its token budget)", "pos"),
        ("attainment", r"\alpha_{slo}", "1", "fraction of requests meeting both latency targets (TTFT and TPOT)", "nonneg"),
        ("completion_rate", r"X_{req}", "1/s", "requests a measured run completes per second: its requests over "
                                               "its duration, first arrival to last completion", "nonneg"),
        ("goodput", r"X_{good}", "1/s", "requests per second that meet both latency targets", "nonneg"),
        ("prefill_instances", r"n_{P}", "1", "prefill instances of a disaggregated deployment", "int"),
        ("decode_instances", r"n_{D}", "1", "decode instances of a disaggregated deployment", "int"),
        ("prefill_rate", r"r_{P}", "1/s", "requests per second one prefill instance serves within the TTFT target", "nonneg"),
        ("decode_rate", r"r_{D}", "1/s", "requests per second one decode instance serves within the TPOT target", "nonneg"),
        ("prefill_devices", r"g_{P}", "1", "devices of one prefill instance", "int"),
        ("decode_devices", r"g_{D}", "1", "devices of one decode instance", "int"),
        ("request_kv_bytes", r"Q_{req}", "bytes", "KV-cache bytes of one request", "nonneg"),
        ("kv_held_bytes", r"Q_{held}", "bytes", "KV-cache bytes a server holds for the requests in it", "nonneg"),
        ("cache_hit_rate", r"h", "1", "fraction of a prompt's tokens whose KV cache is found in a cache tier", "nonneg"),
    ],
}

_ASSUME = {
    "int": dict(integer=True, positive=True),
    "nonneg_int": dict(integer=True, nonnegative=True),
    "pos": dict(positive=True),
    "nonneg": dict(nonnegative=True),
    "real": dict(real=True),
}


def _build() -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for group, rows in _TABLE.items():
        for name, latex, unit, meaning, assume in rows:
            if name in entries:
                raise RuntimeError(f"symbol {name!r} declared twice")
            if assume not in _ASSUME:
                raise RuntimeError(f"symbol {name!r}: unknown assumption {assume!r}")
            entries[name] = Entry(name, latex, unit, meaning, group, assume)
    return entries


NOMENCLATURE: dict[str, Entry] = _build()
#: order of declaration, used to order a formula's arguments
ORDER: dict[str, int] = {name: i for i, name in enumerate(NOMENCLATURE)}


def latex_names() -> dict:
    """sympy symbol -> LaTeX name, for ``sympy.latex(expr, symbol_names=latex_names())``
    (made on first use: it needs sympy)."""
    global _LATEX_NAMES
    if _LATEX_NAMES is None:
        _LATEX_NAMES = {e.symbol: e.latex for e in NOMENCLATURE.values()}
    return _LATEX_NAMES


_LATEX_NAMES: dict | None = None


def __getattr__(name: str):
    if name == "LATEX_NAMES":          # the mapping under its former name
        return latex_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Symbols:
    """Attribute access to the sympy symbols: ``sym.hidden_size``."""

    def __getattr__(self, name: str):
        try:
            return NOMENCLATURE[name].symbol
        except KeyError:
            raise AttributeError(f"no symbol {name!r} in the nomenclature") from None

    def __dir__(self):
        return list(NOMENCLATURE)


sym = _Symbols()


def table_markdown() -> str:
    """The nomenclature as a Markdown table (the README's symbol table)."""
    lines = ["| symbol | name | unit | meaning |", "|---|---|---|---|"]
    for e in NOMENCLATURE.values():
        lines.append(f"| ${e.latex}$ | `{e.name}` | {e.unit} | {e.meaning} |")
    return "\n".join(lines)


# --- dimensions ---------------------------------------------------------------------

#: unit string -> dimension as exponents of the base dimensions bytes, seconds, joules
#: and dollars. FLOP, tokens and counts are pure numbers: a FLOP count is a number of
#: operations, so FLOP/s has the dimension 1/s and W / F_peak is a time; a watt is a
#: joule per second.
DIMENSIONS: dict[str, tuple[int, int, int, int]] = {
    "1": (0, 0, 0, 0), "FLOP": (0, 0, 0, 0), "bytes": (1, 0, 0, 0), "s": (0, 1, 0, 0), "bytes/s": (1, -1, 0, 0),
    "FLOP/s": (0, -1, 0, 0), "tokens/s": (0, -1, 0, 0), "1/s": (0, -1, 0, 0),
    "J": (0, 0, 1, 0), "W": (0, -1, 1, 0), "J/byte": (-1, 0, 1, 0),
    "$": (0, 0, 0, 1), "$/s": (0, -1, 0, 1), "$/J": (0, 0, -1, 1),
}
#: the base dimensions, in the order of a dimension's exponents
BASES = ("bytes", "s", "J", "$")


def dimension(unit: str) -> tuple[int, int, int, int]:
    """Exponents of bytes, seconds, joules and dollars of a nomenclature unit."""
    try:
        return DIMENSIONS[unit]
    except KeyError:
        raise ValueError(f"unit {unit!r} has no dimension; known: {', '.join(DIMENSIONS)}") from None


def describe_dimension(dim: tuple[int, ...]) -> str:
    """A readable name of a dimension: ``(1, -1, 0, 0)`` -> ``'bytes/s'``."""
    for unit, d in DIMENSIONS.items():
        if d == dim and unit not in ("FLOP", "tokens/s"):
            return unit
    return " ".join(f"{b}^{e}" for b, e in zip(BASES, dim) if e) or "1"


def _check_units() -> None:
    for entry in NOMENCLATURE.values():
        dimension(entry.unit)


_check_units()
