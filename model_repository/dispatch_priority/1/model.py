"""Triton entry point for dispatch_priority; the work is in the dispatch_service library."""

import triton_python_backend_utils as pb_utils

from dispatch_service.serving.fused_adapter import fused_adapter_for


class TritonPythonModel:
    def initialize(self, args):
        self.adapter = fused_adapter_for(pb_utils, args)

    def execute(self, requests):
        return self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
