"""Exercise 07.6 (stretch, from scratch): ZeRO-3, a fully sharded data-parallel wrapper (notebooks/07_memory.ipynb).

ZeRO-3 (FSDP) shards the parameters themselves, not only the optimizer's state. Write MyFSDP(module,
compute_dtype=None), a torch.nn.Module, such that

  * its parameters() are this rank's shards only: of every parameter of ``module`` (a tied one, used in two
    places, counts once) about numel / world float32 elements, and nothing the size of the model stays in
    memory between steps (the module's own full parameters are freed once sharded);
  * forward(x) all-gathers the whole parameters just before they are used, runs ``module`` with them and
    returns its output; with ``compute_dtype`` (torch.bfloat16) the gathered parameters and the input are in
    that dtype, so forward and backward compute in it, while the shards, their gradients and the optimizer
    stay float32 (FSDP2's MixedPrecisionPolicy(param_dtype=...) does this: each shard, frozen or not, is cast
    before its all-gather, which so moves half the bytes; full_parameters() gathers float32);
  * after loss.backward() each shard's .grad is its slice of the gradient of the mean loss over every rank's
    batch, in float32 and reduce-scattered in float32 (a gradient computed in bfloat16 is cast before its
    reduce-scatter: FSDP2 would reduce in bfloat16 unless asked otherwise, here the sum must be float32's):
    reduce-scattered in the backward (as each gradient is made, from a hook or your
    autograd.Function's backward, not from a callback at the end of backward nor at the optimizer's step),
    then divided by the world size (a tied weight is one parameter: its gradient, the sum of its uses, is
    reduce-scattered once); two backward() calls before step() add up their gradients in
    .grad (gradient accumulation, as in torch's FSDP); as in torch, a parameter with requires_grad=False
    (frozen) or not used in this forward gets no gradient: its shard's .grad stays None, so that the optimizer
    skips it (no momentum, no weight decay), and nothing of it is reduce-scattered (FSDP2 leaves it out;
    FSDP1's flat layout sent zeros in its place);
  * parameters() lists one shard per parameter of ``module``, in the order of module.named_parameters() (not
    sorted), so that parameter groups can be made of them (the grader gives the last layer half the lr);
  * full_parameters() returns {name: the whole parameter, float32} on every rank, named as
    module.named_parameters() names them (a collective: every rank calls it), to evaluate or save the model;

so that torch.optim.SGD(wrapper.parameters(), ...) on every rank trains the model as one process would on the
whole batch. Only the signature is given: the design is yours. (The lines below only run the module as it is:
``self.module = module`` registers it as a submodule, so its full parameters are listed by parameters() too;
that is the first thing to change.) Gathering again in the backward, as FSDP's reshard_after_forward does, is
not required: autograd may keep the gathered parameters until the backward; what is measured is the memory
between steps.

The grader trains an MLP and a model whose two middle layers share one weight (TiedMLP, as tied embeddings do)
three SGD steps with momentum (the MLP's second after two backwards), at 2 and 3 ranks, in float32 and with
compute_dtype=torch.bfloat16, then a model with a frozen parameter and a layer used in every other step only,
in two parameter groups, and compares each rank's output and full_parameters() with one process's; it counts
the collectives of each step (all-gather and reduce-scatter, the reduce-scatters in the backward;
an all-reduce of whole gradients is ZeRO-2's at best; a process group's own methods and torch's functional
collectives count too) and checks what they carry (the all-gathers this rank's shards, the reduce-scatters its
gradients), the elements in parameters(), the dtype the layers saw, and the bytes your wrapper holds between
steps; torch's fully_shard or FSDP inside your class is refused.
Useful: torch.func.functional_call(module, {name: tensor}, (x,)) runs a module with other tensors in place of
its parameters (a tied one given once is used in both places); an autograd.Function whose forward all-gathers
and whose backward reduce-scatters; all_gather_single and reduce_scatter_single from mgpu_utils.compat;
p.data = torch.empty(0) frees a parameter's storage and keeps the Parameter object (and so a tied weight's
identity).
Move data between the ranks only with torch.distributed collectives and keep state in tensors: the
grader refuses files, mmap, shared memory, torch.from_file, ctypes, the key-value store, and sockets,
processes, pipes and sqlite3 databases of your own.
Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("07.6")
"""
import torch
import torch.distributed as dist


class MyFSDP(torch.nn.Module):
    """``module`` with its parameters sharded over the ranks, gathered for each forward (ZeRO stage 3)."""

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def full_parameters(self) -> dict:
        """{name: the whole parameter, float32} on every rank, named as module.named_parameters() names them."""
        return dict(self.module.named_parameters())        # TODO: gathered from the shards
