"""The reusable parts of lessons 02–08: streams (02), then one module per parallelism.

Lessons put here what a later lesson, a test or a benchmark reuses (a by-hand DataParallel, pipeline
schedules, tensor-parallel layers, memory and performance calculators), never an exercise's solution.
"""
