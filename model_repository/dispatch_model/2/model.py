"""Triton entry point for dispatch_model; the work is in the dispatch_service library."""

import triton_python_backend_utils as pb_utils

from dispatch_service.serving import stub_gc


class TritonPythonModel:
    def initialize(self, args):
        stub_gc.pause()  # set up without the garbage collector; the adapter resumes it
        from dispatch_service.serving.step_adapters import TritonBatchedModelAdapter

        self.adapter = TritonBatchedModelAdapter.from_triton(pb_utils, args)

    def execute(self, requests):
        return self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
