"""Per-order canary routing, shadow scoring and the fallback chain, for both entry points."""
