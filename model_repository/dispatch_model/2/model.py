"""Triton entry point for dispatch_model; the work is in the dispatch_service library."""

import triton_python_backend_utils as pb_utils

from dispatch_service.serving.triton_adapter import adapter_for


class TritonPythonModel:
    def initialize(self, args):
        self.adapter = adapter_for(pb_utils, args, "dispatch_model")

    def execute(self, requests):
        return self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
