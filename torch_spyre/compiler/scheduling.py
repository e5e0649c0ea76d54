"""The Spyre scheduling: fusion rules the generators can lower, and one kernel per fused node.

:class:`SpyreScheduling` (made by :func:`_make_scheduling`, registered by ``backend.register``) decides
fusion with rules it can lower (same iteration space; pointwise into a reduction's loop; pointwise
epilogues over a reduction's outer space) and turns each fused node into one kernel: a
:class:`~torch_spyre.compiler.kernel_ir.KernelSpec` defined in the wrapper and launched per call
(``wrapper.py``). Reductions stay one kernel (no split reductions); templates, benchmarking and
autotuning are not supported. A fused node whose kernel cannot be lowered (its spec, or its program for
the placements the wrapper allocates) marks the ops it came from as fallback kernels and fails the
attempt; the graph is compiled again (``fallback.py``).
"""

from __future__ import annotations

from .._torch import inductor as torch_inductor


def _make_scheduling():
    from . import fallback, kernel_ir

    class SpyreScheduling(torch_inductor.SchedulingBase):
        """Fusion rules the Spyre generators can lower, and one kernel per fused node."""

        kernel_count = 0

        def group_fn(self, sizes):
            sizevars = torch_inductor.current_graph().sizevars
            return tuple(sizevars.simplify(torch_inductor.size_product(s)) for s in sizes)

        def get_backend_features(self, device):
            # REDUCE_TO_SINGLE_ELEMENT: a reduction stays one kernel (Inductor's split reductions make
            # two-stage kernels tuned for GPUs; the card reduces a whole row per core).
            return torch_inductor.reduce_to_single_element()

        # --- fusion ----------------------------------------------------------------------------
        def can_fuse_vertical(self, node1, node2) -> bool:
            return self._can_fuse(node1, node2)

        def can_fuse_horizontal(self, node1, node2) -> bool:
            return self._can_fuse(node1, node2)

        def _can_fuse(self, node1, node2) -> bool:
            if any(n.is_template() or torch_inductor.is_foreach_node(n) for n in (node1, node2)):
                return False
            if any(not torch_inductor.is_fusable_node(n) for n in (node1, node2)):
                return False
            _, (numel1, rnumel1) = node1.group
            _, (numel2, rnumel2) = node2.group
            r1, r2 = node1.is_reduction(), node2.is_reduction()
            if r1 and r2:
                return numel1 == numel2 and rnumel1 == rnumel2
            if not r1 and not r2:
                return numel1 == numel2 and rnumel1 == rnumel2
            red, pw = (node1, node2) if r1 else (node2, node1)
            _, (numel, rnumel) = red.group
            _, (pnumel, _) = pw.group
            if pnumel == numel * rnumel:
                return all(torch_inductor.ranges_compatible((numel, rnumel), n.get_ranges()) for n in pw.get_nodes())
            # A pointwise node over the reduction's outer space: only after the reduction (an epilogue).
            return pnumel == numel and r1

        # --- code generation -------------------------------------------------------------------
        def codegen_node(self, node) -> None:
            nodes = [n for n in node.get_nodes() if n.get_name() not in self.scheduler.removed_ops]
            if not nodes:
                return
            for n in nodes:
                n.mark_run()
            graph = torch_inductor.current_graph()
            wrapper = graph.wrapper_code
            name = wrapper.next_spyre_kernel_name(nodes)
            local = self._kernel_local_buffers(nodes)
            try:
                spec = kernel_ir.kernel_spec(name, nodes, real_name=self._real_name, internal=local)
                fallback.check_generates(spec, nodes, wrapper.layout_plan.stick_dim)
            except kernel_ir.LoweringError as e:
                fallback.mark_unlowered(e)  # the compile is retried with those ops as fallback kernels
                raise
            graph.removed_buffers |= local
            wrapper.define_spyre_kernel(spec)
            wrapper.call_spyre_kernel(spec)
            self.free_buffers_in_scheduler()

        def _kernel_local_buffers(self, nodes) -> set[str]:
            """Buffers written and last read inside this kernel: they stay in scratchpad (Inductor's
            ``can_buffer_be_removed_through_fusion`` decides, as for its own kernels)."""

            fused = torch_inductor.ordered_set(n.get_name() for n in nodes)
            outputs = set(torch_inductor.current_graph().get_output_names())
            local = set()
            for n in nodes:
                for buf in n.get_outputs():
                    name = buf.get_name()
                    if name not in outputs and self.scheduler.can_buffer_be_removed_through_fusion(name, fused):
                        local.add(name)
            return local

        @staticmethod
        def _real_name(name: str) -> str:
            return torch_inductor.current_graph().scheduler.mutation_real_name.get(name, name)

        def codegen_template(self, *args, **kwargs):
            raise kernel_ir.LoweringError("template kernels are not generated by the Spyre backend")

        def codegen_sync(self) -> None:
            pass

        def flush(self) -> None:
            pass

        def ready_to_flush(self) -> bool:
            return False

        def benchmark_fused_nodes(self, nodes):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

        def benchmark_codegened_module(self, module):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

        def generate_kernel_code_from_nodes(self, nodes, benchmark_kernel=False, hint_override=None):
            raise NotImplementedError("the Spyre backend does not benchmark kernels (no autotuning)")

    return SpyreScheduling
