"""What measures the product: the read bench, freshness on recorded timelines (`fresh`), the
host A/B, `replay`, the probes, the device scripts (evals/device/), and the command line
(evals.cli: `shadow-reader replay | fresh | bench | serve`), which sits here, at the top of the
import stack, because it dispatches to every other package."""
