"""`python -m t5nb.tasks --out data`: regenerate the facts world and its vocabulary."""
from t5nb.tasks.world import main

main()
