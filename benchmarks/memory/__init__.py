"""How much memory: the peak of one step per memory technique against its floor, and RSS over a long run."""
