from rm_qdrant.cli import main

main()
