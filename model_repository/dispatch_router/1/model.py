"""Triton entry point for dispatch_router; the work is in the dispatch_service library."""

import triton_python_backend_utils as pb_utils

from dispatch_service.serving import stub_gc


class TritonPythonModel:
    def initialize(self, args):
        stub_gc.pause()  # set up without the garbage collector; the adapter resumes it
        from dispatch_service.serving.router_adapter import router_adapter_for

        self.adapter = router_adapter_for(pb_utils, args)

    async def execute(self, requests):
        return await self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
