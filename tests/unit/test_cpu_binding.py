"""CPU core slices for vLLM CPU replicas: each replica on a node gets its own cores."""

from replicas.cpu_binding import CpuBinding


def test_replicas_get_disjoint_cores() -> None:
    binding = CpuBinding(cores_per_replica=2, cores=[0, 1, 2, 3])
    assert binding.cores_for(0) == [0, 1]
    assert binding.cores_for(1) == [2, 3]


def test_more_replicas_than_cores_wrap_round() -> None:
    binding = CpuBinding(cores_per_replica=1, cores=[4, 5])
    assert [binding.cores_for(rank) for rank in range(3)] == [[4], [5], [4]]


def test_environment_names_the_cores() -> None:
    env = CpuBinding(cores_per_replica=2, cores=[6, 7]).environment(0)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "6,7", "OMP_NUM_THREADS": "2"}
