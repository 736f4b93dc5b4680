"""The instructor's tools: exercise stubs from the solutions, the student release, the course's own
self-checks, and the grader (`python -m course_lib.grade`). Learners never need these.

exercises.py     python -m course_lib.exercises: write exercises/ from solutions/
release.py       python -m course_lib.instructor.release OUT: the course without solutions/
grade/           python -m course_lib.grade SUBMISSIONS --out OUT: grade a class in sandboxed judges
"""
