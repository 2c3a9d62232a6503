print("tandem")
