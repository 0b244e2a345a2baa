"""The scenarios, suites and tickets built into gpurace: data, not code. Installed as the
package ``gpurace_scenarios``; ``gpurace list`` shows them and ``gpurace run NAME`` runs one."""
