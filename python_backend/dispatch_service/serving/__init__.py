"""Triton Python-backend adapters: requests to arrays, arrays to responses, errors per request."""
