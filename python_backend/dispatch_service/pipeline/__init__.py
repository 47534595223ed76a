"""The pipeline steps as plain objects (arrays in, arrays out), composed in process or fused."""
