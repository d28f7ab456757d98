"""The asyncio side of xcloak, name for name: ``xcloak.aio.limiter.AsyncLimiter``
(also exported as ``xcloak.AsyncLimiter``) and ``xcloak.aio.limits``' storages."""

from .limiter import AsyncLimiter, AsyncPipeline

__all__ = ["AsyncLimiter", "AsyncPipeline"]
