"""The runtime: streams and the device clock, program preparation and launch, the profiler."""
